-- DeadLetter: keeps an event that sink @sink refused for good. The same event refused
-- again (the relay restarted before its cursor moved past it) counts one more attempt.
INSERT INTO cloudevent_dead_letters AS d
    (sink, tx, position, ordinal, project, domain, run, action, attempt, phase, version, occurred_at, recorded_at, event, detail)
VALUES (@sink, @tx, @position, @ordinal, @project, @domain, @run, @action, @attempt, @phase, @version,
        @occurred_at, @recorded_at, @event, @detail)
ON CONFLICT (sink, tx, position, ordinal) DO UPDATE
SET detail = EXCLUDED.detail, failed_at = now(), attempts = d.attempts + 1
