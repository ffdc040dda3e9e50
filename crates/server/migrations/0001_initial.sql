-- Sandcell daemon state, version 1. Timestamps are Unix milliseconds (INTEGER), booleans
-- 0/1, JSON maps TEXT: the same schema maps onto PostgreSQL with BIGINT/BOOLEAN/JSONB.

CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY,          -- public id, `key_<12 hex>`
    name          TEXT NOT NULL,
    key_hash      TEXT NOT NULL UNIQUE,      -- sha256 hex of the whole key
    key_prefix    TEXT NOT NULL,             -- `e2b_` + first 4 hex, for display
    is_admin      INTEGER NOT NULL DEFAULT 0,
    max_sandboxes INTEGER,                   -- NULL: no limit
    created_at    INTEGER NOT NULL,
    revoked_at    INTEGER
);

CREATE TABLE sandboxes (
    id            TEXT PRIMARY KEY,
    key_id        TEXT NOT NULL REFERENCES api_keys(id),
    template_id   TEXT NOT NULL,
    runtime       TEXT NOT NULL,             -- gvisor | microvm
    -- creating -> running -> killing -> killed; any -> error (see lifecycle.rs)
    state         TEXT NOT NULL,
    secure        INTEGER NOT NULL,
    access_token  TEXT,                      -- envd X-Access-Token when secure
    metadata      TEXT NOT NULL DEFAULT '{}',
    vcpus         INTEGER NOT NULL,
    memory_mib    INTEGER NOT NULL,
    disk_mib      INTEGER NOT NULL,
    envd_version  TEXT NOT NULL DEFAULT '',
    created_at    INTEGER NOT NULL,
    started_at    INTEGER,
    end_at        INTEGER,                   -- the timeout: killed when reached
    ended_at      INTEGER,
    end_reason    TEXT
);

CREATE INDEX sandboxes_by_key_state ON sandboxes(key_id, state);
CREATE INDEX sandboxes_by_state_end ON sandboxes(state, end_at);
