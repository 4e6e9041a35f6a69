-- PutAndRelease: after "WITH put AS (" and put.sql's statement and ")": gives up the
-- key's reservation if (@owner_id, @holder) hold it, once the entry is stored, in the
-- same statement, so both happen or, when the entry may not be replaced, neither. The
-- columns are put.sql's, then whether the reservation went.
, released AS (
    DELETE FROM reservations
    WHERE project = @project AND domain = @domain AND task_name = @task_name
      AND cache_version = @cache_version AND signature = @signature AND inputs_hash = @inputs_hash
      AND owner_id = @owner_id AND holder = @holder
      AND EXISTS (SELECT 1 FROM put)
    RETURNING 1
)
SELECT put.*, EXISTS (SELECT 1 FROM released) FROM put
