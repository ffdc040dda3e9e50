-- Version 5: E2B's `network.allowPublicTraffic: false`: requests to the sandbox's ports
-- (other than envd's) must carry this token in `e2b-traffic-access-token` (networks.rs).
ALTER TABLE sandbox_networks ADD COLUMN traffic_token TEXT;
