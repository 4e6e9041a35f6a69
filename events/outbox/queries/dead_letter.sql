-- DeadLetter: keeps an entry that sink @sink refused for good. The same entry refused
-- again (the relay restarted before its cursor moved past it) counts one more attempt.
INSERT INTO cloudevent_dead_letters AS d
    (sink, tx, position, project, domain, run, action, attempt, phase, version, occurred_at, recorded_at, event, detail)
VALUES (@sink, @tx, @position, @project, @domain, @run, @action, @attempt, @phase, @version,
        @occurred_at, @recorded_at, @event, @detail)
ON CONFLICT (sink, tx, position) DO UPDATE
SET detail = EXCLUDED.detail, failed_at = now(), attempts = d.attempts + 1
