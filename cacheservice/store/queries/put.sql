-- Put: stores an entry, replacing an existing one only with @overwrite or when it was
-- last written at least @max_age_seconds ago (NULL: never by age). No row comes back
-- when one exists that may not be replaced; of concurrent Puts of one key, the first to
-- insert wins and the others find its row. The columns are the ones scanOutput reads,
-- then whether the entry replaced another.
INSERT INTO cached_outputs AS c (project, domain, task_name, cache_version, signature, inputs_hash,
    output_uri, source_project, source_domain, source_run, source_action, source_attempt, output_bytes, created_at, updated_at)
VALUES (@project, @domain, @task_name, @cache_version, @signature, @inputs_hash,
    @output_uri, @source_project, @source_domain, @source_run, @source_action, @source_attempt, @output_bytes, now(), now())
ON CONFLICT (project, domain, task_name, cache_version, signature, inputs_hash) DO UPDATE
SET output_uri = EXCLUDED.output_uri, source_project = EXCLUDED.source_project, source_domain = EXCLUDED.source_domain,
    source_run = EXCLUDED.source_run, source_action = EXCLUDED.source_action, source_attempt = EXCLUDED.source_attempt,
    output_bytes = EXCLUDED.output_bytes, updated_at = now()
WHERE @overwrite::boolean
   OR (@max_age_seconds::float8 IS NOT NULL AND c.updated_at <= now() - make_interval(secs => @max_age_seconds::float8))
RETURNING output_uri, source_project, source_domain, source_run, source_action, source_attempt, created_at, updated_at,
    xmax <> 0
