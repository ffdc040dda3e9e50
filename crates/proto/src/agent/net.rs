//! The guest network parameters the microvm runtime hands the agent:
//! `ip=ADDR/PREFIX,gw=GATEWAY[,mtu=N][,dns=ADDR][,if=NAME]`, as the kernel parameter
//! `sandcell.net=` at boot and as `/init`'s `sandcellNet` after a restore. The runtime
//! writes the value and the agent parses it, so the format lives here, with both.

use std::net::Ipv4Addr;

/// Linux's `IFNAMSIZ` (`<net/if.h>`): an interface name and its NUL.
const IFNAMSIZ: usize = 16;

/// What `sandcell.net=` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetParams {
    pub addr: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
    pub mtu: Option<u32>,
    pub dns: Option<Ipv4Addr>,
    pub interface: Option<String>,
}

impl NetParams {
    /// Parses the value of `sandcell.net=`.
    pub fn parse(value: &str) -> Result<NetParams, String> {
        let (mut ip, mut gw, mut mtu, mut dns, mut iface) = (None, None, None, None, None);
        for item in value.split(',') {
            let (key, v) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?} is not key=value"))?;
            let bad = |what: &str| format!("{key}={v}: not {what}");
            match key {
                "ip" => {
                    let (a, p) = v.split_once('/').ok_or_else(|| bad("ADDR/PREFIX"))?;
                    let a: Ipv4Addr = a.parse().map_err(|_| bad("an IPv4 address"))?;
                    let p: u8 = p.parse().map_err(|_| bad("a prefix length"))?;
                    if !(1..=32).contains(&p) {
                        return Err(bad("a prefix length of 1 to 32"));
                    }
                    ip = Some((a, p));
                }
                "gw" => gw = Some(v.parse().map_err(|_| bad("an IPv4 address"))?),
                "mtu" => {
                    let m: u32 = v.parse().map_err(|_| bad("a number"))?;
                    if !(68..=65535).contains(&m) {
                        return Err(bad("an MTU of 68 to 65535"));
                    }
                    mtu = Some(m);
                }
                "dns" => dns = Some(v.parse().map_err(|_| bad("an IPv4 address"))?),
                "if" => {
                    if v.is_empty() || v.len() >= IFNAMSIZ || v.contains('/') {
                        return Err(bad("an interface name"));
                    }
                    iface = Some(v.to_owned());
                }
                _ => return Err(format!("unknown key {key:?}")),
            }
        }
        let (addr, prefix) = ip.ok_or("ip= is missing")?;
        let gateway = gw.ok_or("gw= is missing")?;
        Ok(NetParams {
            addr,
            prefix,
            gateway,
            mtu,
            dns,
            interface: iface,
        })
    }

    pub fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from(
            u32::MAX
                .checked_shl(32 - u32::from(self.prefix))
                .unwrap_or(0),
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_parameter() {
        let p = NetParams::parse("ip=10.11.0.2/30,gw=10.11.0.1,mtu=1500,dns=10.11.0.1").unwrap();
        assert_eq!(p.addr, Ipv4Addr::new(10, 11, 0, 2));
        assert_eq!(p.prefix, 30);
        assert_eq!(p.netmask(), Ipv4Addr::new(255, 255, 255, 252));
        assert_eq!(p.gateway, Ipv4Addr::new(10, 11, 0, 1));
        assert_eq!(p.mtu, Some(1500));
        assert_eq!(p.dns, Some(Ipv4Addr::new(10, 11, 0, 1)));
        assert_eq!(p.interface, None);
        let p = NetParams::parse("gw=10.0.0.1,ip=10.0.0.2/24,if=eth1").unwrap();
        assert_eq!(p.netmask(), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(p.interface.as_deref(), Some("eth1"));
        assert_eq!(
            NetParams::parse("ip=1.2.3.4/32,gw=1.1.1.1")
                .unwrap()
                .netmask(),
            Ipv4Addr::BROADCAST
        );
    }

    #[test]
    fn refuses_bad_parameters() {
        for bad in [
            "",
            "ip=10.0.0.2/24",
            "gw=10.0.0.1",
            "ip=10.0.0.2,gw=10.0.0.1",
            "ip=10.0.0.2/33,gw=10.0.0.1",
            "ip=10.0.0.2/0,gw=10.0.0.1",
            "ip=10.0.0.300/24,gw=10.0.0.1",
            "ip=10.0.0.2/24,gw=10.0.0.1,mtu=10",
            "ip=10.0.0.2/24,gw=10.0.0.1,if=a-name-longer-than-15",
            "ip=10.0.0.2/24,gw=10.0.0.1,colour=blue",
            "ip=10.0.0.2/24,gw",
        ] {
            assert!(NetParams::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
