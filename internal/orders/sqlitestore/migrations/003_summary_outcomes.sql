-- older binaries: refuse: an older binary's projection adds every order to
-- total_amount, which counts the confirmed ones only from here on.

-- The summary counts outcomes: confirmed and rejected orders (from the
-- OrderConfirmed.v1 and OrderRejected.v1 events), and total_amount sums
-- the confirmed orders only. Every event only adds to a row, so a row may
-- exist with zero orders (an order's confirmation applied before its
-- creation) and a zero total. SQLite cannot drop a CHECK: the table is
-- rebuilt.
CREATE TABLE customer_order_summary_003 (
    customer_id   INTEGER PRIMARY KEY,
    orders        INTEGER NOT NULL DEFAULT 0 CHECK (orders >= 0),
    confirmed     INTEGER NOT NULL DEFAULT 0 CHECK (confirmed >= 0),
    rejected      INTEGER NOT NULL DEFAULT 0 CHECK (rejected >= 0),
    total_amount  TEXT NOT NULL
        CHECK (typeof(total_amount) = 'text' AND total_amount GLOB '[0-9]*.[0-9][0-9][0-9][0-9]' AND total_amount NOT GLOB '*[^0-9.]*'),
    last_order_id INTEGER NOT NULL,
    updated_at    TEXT NOT NULL
) STRICT;

-- Existing rows: total_amount added every order. orders (the
-- OrderCreated.v1 events applied) stays; the outcomes are recomputed below
-- from the orders' statuses: the orders confirmed or rejected before this
-- migration never emitted an outcome event.
INSERT INTO customer_order_summary_003 (customer_id, orders, total_amount, last_order_id, updated_at)
SELECT customer_id, orders, '0.0000', last_order_id, updated_at FROM customer_order_summary;

DROP TABLE customer_order_summary;
ALTER TABLE customer_order_summary_003 RENAME TO customer_order_summary;

-- The confirmed amounts are added exactly as integers: their integer parts
-- and their 4 fractional digits apart. A customer whose orders were
-- decided but not yet projected gets a row with zero orders, completed by
-- the OrderCreated.v1 events still on their way.
WITH outcome AS (
    SELECT customer_id,
           sum(status = 'CONFIRMED') AS confirmed,
           sum(status = 'REJECTED') AS rejected,
           coalesce(sum(CASE WHEN status = 'CONFIRMED' THEN CAST(substr(amount, 1, length(amount) - 5) AS INTEGER) END), 0) AS units,
           coalesce(sum(CASE WHEN status = 'CONFIRMED' THEN CAST(substr(amount, -4) AS INTEGER) END), 0) AS fraction,
           max(id) AS last_order_id
    FROM customer_order
    WHERE status IN ('CONFIRMED', 'REJECTED')
    GROUP BY customer_id
)
INSERT INTO customer_order_summary AS s
    (customer_id, orders, confirmed, rejected, total_amount, last_order_id, updated_at)
SELECT customer_id, 0, confirmed, rejected,
       printf('%d.%04d', units + fraction / 10000, fraction % 10000),
       last_order_id, strftime('%Y-%m-%dT%H:%M:%f000Z')
FROM outcome WHERE true
ON CONFLICT (customer_id) DO UPDATE SET
    confirmed     = excluded.confirmed,
    rejected      = excluded.rejected,
    total_amount  = excluded.total_amount,
    last_order_id = max(s.last_order_id, excluded.last_order_id),
    updated_at    = excluded.updated_at;
