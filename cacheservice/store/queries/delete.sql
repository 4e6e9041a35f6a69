-- Delete: the entry of a key.
DELETE FROM cached_outputs
WHERE project = @project AND domain = @domain AND task_name = @task_name
  AND cache_version = @cache_version AND signature = @signature AND inputs_hash = @inputs_hash
