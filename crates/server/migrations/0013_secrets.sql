-- Version 13: E2B's secrets (secrets/). A secret belongs to one API key (E2B: its team);
-- `name` is stored lower-case, unique per key. Its values are versions, sealed with the
-- daemon's key ring (`<data-dir>/secrets.key`, never in this file): `kid` names the key,
-- the nonce and ciphertext are ChaCha20-Poly1305's, bound to (secret id, version). An
-- update appends a version; `current_version` is the one injected.
CREATE TABLE secrets (
    id              TEXT PRIMARY KEY,           -- `sec_<24 hex>`
    key_id          TEXT NOT NULL REFERENCES api_keys(id),
    name            TEXT NOT NULL,
    metadata        TEXT NOT NULL,              -- JSON object of strings
    current_version INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    UNIQUE (key_id, name)
);

CREATE TABLE secret_versions (
    secret_id   TEXT NOT NULL REFERENCES secrets(id) ON DELETE CASCADE,
    version     INTEGER NOT NULL,
    kid         TEXT NOT NULL,
    nonce       BLOB NOT NULL,
    ciphertext  BLOB NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (secret_id, version)
);
