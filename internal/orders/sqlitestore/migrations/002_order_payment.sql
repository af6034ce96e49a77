-- older binaries: accept: a nullable column; the rows older binaries write
-- leave it NULL, as the rows from before it have it.

-- The payment the order saga charged for the order (NULL until then).
ALTER TABLE customer_order ADD COLUMN payment_id INTEGER;
