-- Get: the entry of a key, unless it was last written more than @max_age_seconds ago
-- (NULL: at any age). The columns are the ones scanOutput reads.
SELECT output_uri, source_project, source_domain, source_run, source_action, source_attempt, created_at, updated_at
FROM cached_outputs
WHERE project = @project AND domain = @domain AND task_name = @task_name
  AND cache_version = @cache_version AND signature = @signature AND inputs_hash = @inputs_hash
  AND (@max_age_seconds::float8 IS NULL OR updated_at > now() - make_interval(secs => @max_age_seconds::float8))
