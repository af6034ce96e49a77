-- older binaries: accept: the triggers refuse only amounts an older binary
-- refuses already when it validates the request.

-- PostgreSQL's payment has CHECK (amount > 0); SQLite cannot add a CHECK
-- to an existing table without rebuilding it, so triggers refuse a
-- non-positive amount on INSERT and UPDATE instead. amount is decimal TEXT
-- (the CHECK of 001 already refuses a sign or any other format), compared
-- as a number: '0.0000' and '000.0000' are refused, '0.0001' is kept. The
-- rows already stored are not checked.
CREATE TRIGGER payment_amount_positive_insert
BEFORE INSERT ON payment
WHEN CAST(NEW.amount AS NUMERIC) <= 0
BEGIN
    SELECT RAISE(ABORT, 'payment amount must be positive');
END;

CREATE TRIGGER payment_amount_positive_update
BEFORE UPDATE OF amount ON payment
WHEN CAST(NEW.amount AS NUMERIC) <= 0
BEGIN
    SELECT RAISE(ABORT, 'payment amount must be positive');
END;
