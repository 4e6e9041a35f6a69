-- ReleaseReservation: a key's reservation, if (@owner_id, @holder) hold it.
DELETE FROM reservations
WHERE project = @project AND domain = @domain AND task_name = @task_name
  AND cache_version = @cache_version AND signature = @signature AND inputs_hash = @inputs_hash
  AND owner_id = @owner_id AND holder = @holder
