-- Invalidate: every entry of a task, or of one of its cache versions when @cache_version
-- is not empty. Both walk the primary key's prefix.
DELETE FROM cached_outputs
WHERE project = @project AND domain = @domain AND task_name = @task_name
  AND (@cache_version::text = '' OR cache_version = @cache_version::text)
