-- older binaries: refuse: the first migration: no binary predates it.

CREATE TABLE customer_order (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id bigint NOT NULL CHECK (customer_id > 0),
    amount      numeric(19,4) NOT NULL CHECK (amount > 0),
    status      text NOT NULL,
    items       jsonb NOT NULL CHECK (jsonb_typeof(items) = 'array'),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE customer_order_summary (
    customer_id   bigint PRIMARY KEY,
    orders        bigint NOT NULL CHECK (orders > 0),
    total_amount  numeric(30,4) NOT NULL CHECK (total_amount > 0),
    last_order_id bigint NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
