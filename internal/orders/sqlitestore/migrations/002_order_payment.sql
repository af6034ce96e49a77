-- The payment the order saga charged for the order (NULL until then).
ALTER TABLE customer_order ADD COLUMN payment_id INTEGER;
