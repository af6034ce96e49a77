-- older binaries: refuse: the first migration: no binary predates it.

CREATE TABLE customer_order (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    customer_id INTEGER NOT NULL CHECK (customer_id > 0),
    amount      TEXT NOT NULL
        CHECK (typeof(amount) = 'text' AND amount GLOB '[0-9]*.[0-9][0-9][0-9][0-9]' AND amount NOT GLOB '*[^0-9.]*'),
    status      TEXT NOT NULL,
    items       TEXT NOT NULL CHECK (json_valid(items) AND json_type(items) = 'array'),
    created_at  TEXT NOT NULL
) STRICT;

CREATE TABLE customer_order_summary (
    customer_id   INTEGER PRIMARY KEY,
    orders        INTEGER NOT NULL CHECK (orders > 0),
    total_amount  TEXT NOT NULL
        CHECK (typeof(total_amount) = 'text' AND total_amount GLOB '[0-9]*.[0-9][0-9][0-9][0-9]' AND total_amount NOT GLOB '*[^0-9.]*'),
    last_order_id INTEGER NOT NULL,
    updated_at    TEXT NOT NULL
) STRICT;
