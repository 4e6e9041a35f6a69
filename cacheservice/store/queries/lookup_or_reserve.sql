-- LookupOrReserve (and, with @skip_lookup, GetOrExtendReservation): the entry of a key
-- unless it was last written more than @max_age_seconds ago, or else one conditional
-- upsert that takes the key's reservation for (@owner_id, @holder) when it is free or
-- expired, or extends it when they hold it, for @heartbeat_seconds x @grace from now;
-- when it does not write, the reservation is read and comes back with acquired false.
-- A hit writes nothing. The columns are kind ('hit', 'claimed' or 'held'), the entry's
-- (NULL unless a hit), then the reservation's (NULL for a hit). The holder's action
-- (@holder_run, @holder_action; NULL for none) comes back to everyone; a holder extending
-- without naming it keeps the one it named. A reservation stored without a holder (before
-- holders were recorded) matches no claimant.
--
-- Both reads use the statement's snapshot. A holder that stored the entry and released
-- the reservation after it was taken leaves the reservation free and the entry unseen:
-- a reservation newly taken asks cached_output_committed, after taking it and with a
-- snapshot of its own, whether the entry is there now (the last column), and then the
-- store reads it and gives the reservation back. A reservation taken by a claimant
-- committed after the snapshot comes back as no row, and the store runs the statement
-- again.
WITH hit AS (
    SELECT output_uri, source_project, source_domain, source_run, source_action, source_attempt, created_at, updated_at
    FROM cached_outputs
    WHERE NOT @skip_lookup::boolean
      AND project = @project AND domain = @domain AND task_name = @task_name
      AND cache_version = @cache_version AND signature = @signature AND inputs_hash = @inputs_hash
      AND (@max_age_seconds::float8 IS NULL OR updated_at > now() - make_interval(secs => @max_age_seconds::float8))
), claimed AS (
    INSERT INTO reservations AS r (project, domain, task_name, cache_version, signature, inputs_hash,
        owner_id, holder, holder_run, holder_action, heartbeat_interval, expires_at)
    SELECT @project, @domain, @task_name, @cache_version, @signature, @inputs_hash,
        @owner_id, @holder, @holder_run::text, @holder_action::text, make_interval(secs => @heartbeat_seconds::float8),
        now() + make_interval(secs => @heartbeat_seconds::float8 * @grace::integer)
    WHERE NOT EXISTS (SELECT 1 FROM hit)
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
SELECT 'hit', output_uri, source_project, source_domain, source_run, source_action, source_attempt, created_at, updated_at,
    NULL::interval, NULL::timestamptz, NULL::text, NULL::text, false, false, false, false
FROM hit
UNION ALL
SELECT 'claimed', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    heartbeat_interval, expires_at, holder_run, holder_action, true, inserted, extended,
    NOT @skip_lookup::boolean AND NOT extended
        AND cached_output_committed(@project, @domain, @task_name, @cache_version, @signature, @inputs_hash)
FROM claimed
UNION ALL
SELECT 'held', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    heartbeat_interval, expires_at, holder_run, holder_action, false, false, false, false
FROM reservations
WHERE project = @project AND domain = @domain AND task_name = @task_name
  AND cache_version = @cache_version AND signature = @signature AND inputs_hash = @inputs_hash
  AND NOT EXISTS (SELECT 1 FROM hit) AND NOT EXISTS (SELECT 1 FROM claimed)
