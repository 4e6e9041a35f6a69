-- Up to @limit actions the previous release recorded, which name no cluster (00015's
-- index finds them), with the event that names it.
SELECT id, event FROM actions WHERE cluster IS NULL ORDER BY id LIMIT @limit
