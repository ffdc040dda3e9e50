-- Version 4: sandbox networks (networks.rs).

-- The egress rules of a sandbox (E2B's fields, JSON as `PUT /sandboxes/{id}/network` takes
-- them) and the host network it runs on (sandcell-net's network id): what a restarted
-- daemon needs to take the network over with the sandbox.
CREATE TABLE sandbox_networks (
    sandbox_id  TEXT PRIMARY KEY REFERENCES sandboxes(id),
    net_id      TEXT,
    egress      TEXT NOT NULL
);

-- Private networks (our extension): named per API key; only that key's sandboxes join.
CREATE TABLE private_networks (
    key_id      TEXT NOT NULL REFERENCES api_keys(id),
    name        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (key_id, name)
);

CREATE TABLE private_network_members (
    key_id      TEXT NOT NULL,
    name        TEXT NOT NULL,
    sandbox_id  TEXT NOT NULL REFERENCES sandboxes(id),
    PRIMARY KEY (key_id, name, sandbox_id),
    FOREIGN KEY (key_id, name) REFERENCES private_networks(key_id, name) ON DELETE CASCADE
);

CREATE INDEX private_network_members_by_sandbox ON private_network_members(sandbox_id);
