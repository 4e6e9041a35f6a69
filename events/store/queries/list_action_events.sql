-- ListActionEvents: a page of one action's events in order of attempt, occurrence, phase
-- and version, after the cursor (@attempt, @occurred_at, @phase, @version).
--
-- At most @limit rows come from the primary key, the page's size plus the one that says
-- another page exists, so that Postgres sends only what a page takes: a page of large
-- events costs the network and the service only what it returns. Of those, the first two
-- always go, since the first is taken whatever its size; after that, a row starting
-- beyond the byte budget (@max_bytes, each row counting @item_overhead beyond its event)
-- cannot be the first one left out. The store decides which of the rest fit.
SELECT attempt, occurred_at, phase, version, event FROM (
    SELECT attempt, occurred_at, phase, version, event,
           sum(octet_length(event) + @item_overhead::integer) OVER w
               - (octet_length(event) + @item_overhead::integer) AS bytes_before,
           row_number() OVER w AS n
    FROM (
        SELECT attempt, occurred_at, phase, version, event FROM action_events
        WHERE project = @project AND domain = @domain AND run = @run AND action = @action
          -- The action of @cluster (Store.ListActionEvents resolves it first when the
          -- caller named none); NULL: one the previous release recorded, and its events.
          AND (cluster = @cluster::text OR cluster IS NULL)
          -- Only the action's partition is read: the filing is known before the scan.
          AND filed_at = (SELECT filed_at FROM actions
                          WHERE project = @project AND domain = @domain AND run = @run AND action = @action
                            AND (cluster = @cluster::text OR cluster IS NULL))
          AND (attempt, occurred_at, phase, version) > (@attempt, @occurred_at, @phase, @version)
        ORDER BY attempt, occurred_at, phase, version
        LIMIT @limit
    ) limited
    WINDOW w AS (ORDER BY attempt, occurred_at, phase, version ROWS UNBOUNDED PRECEDING)
) page
WHERE n <= 2 OR bytes_before <= @max_bytes
ORDER BY attempt, occurred_at, phase, version
