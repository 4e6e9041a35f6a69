-- GetOrExtendReservation: one conditional upsert takes a key's reservation for
-- (@owner_id, @holder) when it is free or expired, or extends it when they hold it, for
-- @heartbeat_seconds x @grace from now. When it does not write, the reservation is read
-- in the same statement, and comes back with acquired false.
--
-- That read uses the statement's snapshot, which may predate a reservation the upsert
-- saw being committed concurrently; then no row comes back and the store runs the
-- statement again, with a fresh snapshot. A reservation stored without a holder (before
-- holders were recorded) matches no claimant. The holder's action (@holder_run,
-- @holder_action; NULL for none) comes back to everyone; a holder extending without
-- naming it keeps the one it named.
WITH claimed AS (
    INSERT INTO reservations AS r (project, domain, task_name, cache_version, signature, inputs_hash,
        owner_id, holder, holder_run, holder_action, heartbeat_interval, expires_at)
    VALUES (@project, @domain, @task_name, @cache_version, @signature, @inputs_hash,
        @owner_id, @holder, @holder_run::text, @holder_action::text, make_interval(secs => @heartbeat_seconds::float8),
        now() + make_interval(secs => @heartbeat_seconds::float8 * @grace::integer))
    ON CONFLICT (project, domain, task_name, cache_version, signature, inputs_hash) DO UPDATE
    SET owner_id = EXCLUDED.owner_id, holder = EXCLUDED.holder,
        previous_owner = r.owner_id, previous_holder = r.holder,
        holder_run = CASE WHEN r.owner_id = EXCLUDED.owner_id AND r.holder = EXCLUDED.holder
                          AND EXCLUDED.holder_run IS NULL THEN r.holder_run ELSE EXCLUDED.holder_run END,
        holder_action = CASE WHEN r.owner_id = EXCLUDED.owner_id AND r.holder = EXCLUDED.holder
                             AND EXCLUDED.holder_run IS NULL THEN r.holder_action ELSE EXCLUDED.holder_action END,
        heartbeat_interval = EXCLUDED.heartbeat_interval, expires_at = EXCLUDED.expires_at
    WHERE (r.owner_id = EXCLUDED.owner_id AND r.holder = EXCLUDED.holder) OR r.expires_at < now()
    RETURNING heartbeat_interval, expires_at, holder_run, holder_action, xmax = 0 AS inserted,
        coalesce(previous_owner = owner_id AND previous_holder = holder, false) AS extended
)
SELECT heartbeat_interval, expires_at, holder_run, holder_action, true AS acquired, inserted, extended FROM claimed
UNION ALL
SELECT heartbeat_interval, expires_at, holder_run, holder_action, false, false, false FROM reservations
WHERE project = @project AND domain = @domain AND task_name = @task_name
  AND cache_version = @cache_version AND signature = @signature AND inputs_hash = @inputs_hash
  AND NOT EXISTS (SELECT 1 FROM claimed)
