-- DeleteExpiredReservations: up to @limit reservations that expired before now, oldest
-- first, skipping those a claimant is taking over.
DELETE FROM reservations WHERE ctid IN (
    SELECT ctid FROM reservations WHERE expires_at < now() ORDER BY expires_at LIMIT @limit FOR UPDATE SKIP LOCKED)
