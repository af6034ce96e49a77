-- older binaries: accept: an index, which older binaries do not need.

-- The stuck-order watchdog's scan: orders still CREATED, oldest first.
CREATE INDEX customer_order_created_idx ON customer_order (created_at)
    WHERE status = 'CREATED';
