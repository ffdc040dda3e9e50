-- Version 17: E2B's `network.egressProxy` (a SOCKS5 proxy all of the sandbox's outbound TCP
-- goes through): `{"address", "username", "password"}` as JSON, NULL without one. The
-- password is needed to dial the proxy after a resume, a restore or a daemon restart; it is
-- never returned by the API (networks/egress_proxy.rs).
ALTER TABLE sandbox_networks ADD COLUMN egress_proxy TEXT;
