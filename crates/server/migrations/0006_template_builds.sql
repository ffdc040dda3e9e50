-- Version 6: E2B template builds (template_api.rs, template_builds.rs). A build is made by
-- POST /v3/templates (status 'waiting'), started by POST /v2/templates/{t}/builds/{b}
-- ('building') and ends 'ready' or 'error'. A daemon that stops mid-build leaves it
-- 'error' with reason 'interrupted' at its next start. The logs are written when the
-- build ends (while it runs they are in memory).
CREATE TABLE template_builds (
    build_id    TEXT PRIMARY KEY,
    template_id TEXT NOT NULL,
    key_id      TEXT NOT NULL,
    status      TEXT NOT NULL,
    reason      TEXT,
    reason_step TEXT,
    cpu_count   INTEGER,
    memory_mb   INTEGER,
    created_at  INTEGER NOT NULL,
    finished_at INTEGER
);
CREATE INDEX template_builds_template ON template_builds (template_id);

CREATE TABLE template_build_logs (
    build_id     TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    level        TEXT NOT NULL,
    message      TEXT NOT NULL,
    step         TEXT,
    PRIMARY KEY (build_id, seq)
);
