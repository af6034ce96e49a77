-- older binaries: refuse: the first migration: no binary predates it.

CREATE TABLE payment (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    payment_provider    TEXT NOT NULL,
    external_payment_id TEXT NOT NULL,
    amount              TEXT NOT NULL
        CHECK (typeof(amount) = 'text' AND amount GLOB '[0-9]*.[0-9][0-9][0-9][0-9]' AND amount NOT GLOB '*[^0-9.]*'),
    status              TEXT NOT NULL,
    customer_id         INTEGER NOT NULL,
    created_at          TEXT NOT NULL,
    CONSTRAINT payment_provider_external_id_key UNIQUE (payment_provider, external_payment_id)
) STRICT;
