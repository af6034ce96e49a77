-- older binaries: refuse: the first migration: no binary predates it.

CREATE TABLE payment (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payment_provider    text NOT NULL,
    external_payment_id text NOT NULL,
    amount              numeric(19,4) NOT NULL CHECK (amount > 0),
    status              text NOT NULL,
    customer_id         bigint NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT payment_provider_external_id_key UNIQUE (payment_provider, external_payment_id)
);
