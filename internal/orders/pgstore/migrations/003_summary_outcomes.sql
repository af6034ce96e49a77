-- older binaries: refuse: an older binary's projection adds every order to
-- total_amount, which counts the confirmed ones only from here on.

-- The summary counts outcomes: confirmed and rejected orders (from the
-- OrderConfirmed.v1 and OrderRejected.v1 events), and total_amount sums
-- the confirmed orders only. Every event only adds to a row, so a row may
-- exist with zero orders (an order's confirmation applied before its
-- creation) and a zero total.
ALTER TABLE customer_order_summary
    DROP CONSTRAINT IF EXISTS customer_order_summary_orders_check,
    DROP CONSTRAINT IF EXISTS customer_order_summary_total_amount_check,
    ADD COLUMN confirmed bigint NOT NULL DEFAULT 0,
    ADD COLUMN rejected  bigint NOT NULL DEFAULT 0;

ALTER TABLE customer_order_summary
    ADD CONSTRAINT customer_order_summary_counts_check
        CHECK (orders >= 0 AND confirmed >= 0 AND rejected >= 0),
    ADD CONSTRAINT customer_order_summary_total_amount_check
        CHECK (total_amount >= 0);

-- Existing rows: total_amount added every order. Recompute the outcomes
-- from the orders' statuses: the orders confirmed or rejected before this
-- migration never emitted an outcome event. orders (the OrderCreated.v1
-- events applied) stays; a customer whose orders were decided but not yet
-- projected gets a row with zero orders, completed by the OrderCreated.v1
-- events still on their way.
UPDATE customer_order_summary SET total_amount = 0;

INSERT INTO customer_order_summary AS s
    (customer_id, orders, confirmed, rejected, total_amount, last_order_id)
SELECT customer_id, 0,
       count(*) FILTER (WHERE status = 'CONFIRMED'),
       count(*) FILTER (WHERE status = 'REJECTED'),
       coalesce(sum(amount) FILTER (WHERE status = 'CONFIRMED'), 0),
       max(id)
FROM customer_order
WHERE status IN ('CONFIRMED', 'REJECTED')
GROUP BY customer_id
ORDER BY customer_id
ON CONFLICT (customer_id) DO UPDATE SET
    confirmed     = excluded.confirmed,
    rejected      = excluded.rejected,
    total_amount  = excluded.total_amount,
    last_order_id = greatest(s.last_order_id, excluded.last_order_id),
    updated_at    = now();
