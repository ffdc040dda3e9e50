-- Version 2: sandboxes outlive the daemon (re-adopted after a restart), metering.

-- The runtime's SandboxHandle (JSON) of a running sandbox: what a restarted daemon needs to
-- take it over (pid and start time of its host process, its sockets). NULL before it runs.
ALTER TABLE sandboxes ADD COLUMN handle TEXT;

-- One row per stretch of time a sandbox ran (one today; pause/resume will add more).
-- `open` rows are still running: their end_ms is the last flush (the daemon moves it
-- forward every few seconds and on every state change), and reads count them up to now.
CREATE TABLE usage_intervals (
    sandbox_id  TEXT NOT NULL REFERENCES sandboxes(id),
    key_id      TEXT NOT NULL REFERENCES api_keys(id),
    vcpus       INTEGER NOT NULL,
    memory_mib  INTEGER NOT NULL,
    start_ms    INTEGER NOT NULL,
    end_ms      INTEGER NOT NULL,
    open        INTEGER NOT NULL,
    PRIMARY KEY (sandbox_id, start_ms)
);

CREATE INDEX usage_by_key_end ON usage_intervals(key_id, end_ms);
CREATE INDEX usage_open ON usage_intervals(open);
