//! virtio-net on a TAP device (virtio 1.2 §5.1): one receive and one transmit queue,
//! frames carried with the 12-byte `virtio_net_hdr_v1`, which is also the TAP's vnet
//! header (`IFF_VNET_HDR`, `TUNSETVNETHDRSZ` 12), so frames pass through unchanged and
//! checksum / TSO offloads work end to end.
//!
//! - [`tap`]: the [`NetBackend`] trait and [`Tap`], the real TAP (`/dev/net/tun`).
//! - [`device`]: [`Net`], the device model: feature negotiation, config space (MAC),
//!   the RX and TX paths on the VMM thread.
//! - [`persist`]: [`NetState`], what a snapshot keeps (TAP name, MAC); a restore opens
//!   the TAP again by name in the new process's network namespace.

mod device;
mod persist;
mod tap;

pub use device::{
    MAX_FRAME_LEN, Net, NetCounters, NetError, QUEUE_SIZE, RX_QUEUE, TX_QUEUE, VNET_HDR_LEN,
};
pub use persist::{NetRestoreArgs, NetState};
pub use tap::{NetBackend, Tap, TapError, offload_flags};

/// A MAC address in its usual text form `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for byte in &mut mac {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(mac)
}

#[cfg(test)]
mod tests;
