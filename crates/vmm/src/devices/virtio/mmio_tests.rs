//! virtio-mmio transport: register semantics and the status state machine, driven the
//! way Linux's virtio_mmio driver drives it, over real guest memory.

use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::device::{InterruptKind, VIRTIO_F_VERSION_1, VirtioDevice, lock};
use super::mmio::{MmioTransport, QueueSetupError};
use super::rng::Rng;
use super::test_utils::*;
use crate::bus::BusDevice;

const DRIVER_READY: u32 =
    VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK;

fn rng_transport() -> (Arc<Mutex<Rng>>, MmioTransport) {
    let dev = Arc::new(Mutex::new(Rng::new().unwrap()));
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let t = MmioTransport::new(guest_memory(), dev.clone(), irq).unwrap();
    (dev, t)
}

#[test]
fn identification_registers() {
    let (_dev, mut t) = rng_transport();
    assert_eq!(read_reg(&mut t, 0x00), u32::from_le_bytes(*b"virt"));
    assert_eq!(read_reg(&mut t, 0x04), 2);
    assert_eq!(read_reg(&mut t, 0x08), 4); // VIRTIO_ID_RNG
    write_reg(&mut t, 0x30, 0);
    assert_eq!(read_reg(&mut t, 0x34), 256);
    write_reg(&mut t, 0x30, 1);
    assert_eq!(read_reg(&mut t, 0x34), 0, "no queue 1: QueueNumMax reads 0");
    assert_eq!(read_reg(&mut t, 0xb0), u32::MAX, "no shared memory regions");
}

#[test]
fn feature_windows_follow_select() {
    let (dev, mut t) = rng_transport();
    let offered = lock(&dev).avail_features();
    write_reg(&mut t, 0x14, 0);
    assert_eq!(read_reg(&mut t, 0x10), offered as u32);
    write_reg(&mut t, 0x14, 1);
    assert_eq!(read_reg(&mut t, 0x10), (offered >> 32) as u32);
    assert_eq!(
        read_reg(&mut t, 0x10) & 1,
        1,
        "VERSION_1 is bit 0 of the high word"
    );
    write_reg(&mut t, 0x14, 7);
    assert_eq!(read_reg(&mut t, 0x10), 0);
}

#[test]
fn driver_features_masked_to_offer() {
    let (dev, mut t) = rng_transport();
    negotiate(&mut t, u64::MAX);
    let d = lock(&dev);
    assert_eq!(d.acked_features(), d.avail_features());
}

#[test]
fn features_ok_refused_without_version_1() {
    let (dev, mut t) = rng_transport();
    let status = negotiate(&mut t, !VIRTIO_F_VERSION_1);
    assert_eq!(status & VIRTIO_CONFIG_S_FEATURES_OK, 0);
    assert_eq!(lock(&dev).acked_features(), 0);
}

#[test]
fn status_must_progress_in_order() {
    let (_dev, mut t) = rng_transport();
    // DRIVER_OK straight away is ignored.
    write_reg(&mut t, 0x70, VIRTIO_CONFIG_S_DRIVER_OK);
    assert_eq!(read_reg(&mut t, 0x70), 0);
    write_reg(&mut t, 0x70, VIRTIO_CONFIG_S_ACKNOWLEDGE);
    // Skipping DRIVER is ignored.
    write_reg(
        &mut t,
        0x70,
        VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_FEATURES_OK,
    );
    assert_eq!(read_reg(&mut t, 0x70), VIRTIO_CONFIG_S_ACKNOWLEDGE);
    // Clearing a bit other than by reset is ignored.
    write_reg(&mut t, 0x70, VIRTIO_CONFIG_S_DRIVER);
    assert_eq!(read_reg(&mut t, 0x70), VIRTIO_CONFIG_S_ACKNOWLEDGE);
}

#[test]
fn driver_ok_activates_and_zero_resets() {
    let mem = guest_memory();
    let (dev, mut t) = rng_transport();
    let q = DriverQueue::new(&mem, 0, 16);
    let status = bring_up(&mut t, &[&q]);
    assert_eq!(status, DRIVER_READY | VIRTIO_CONFIG_S_DRIVER_OK);
    assert!(lock(&dev).is_activated());
    assert_eq!(read_reg(&mut t, 0x44), 1);

    write_reg(&mut t, 0x70, 0);
    assert_eq!(read_reg(&mut t, 0x70), 0);
    assert!(!lock(&dev).is_activated());
    assert_eq!(lock(&dev).acked_features(), 0);
    assert_eq!(read_reg(&mut t, 0x44), 0, "queue state cleared by reset");

    // And the device can be brought up again.
    let status = bring_up(&mut t, &[&q]);
    assert_eq!(
        status & VIRTIO_CONFIG_S_DRIVER_OK,
        VIRTIO_CONFIG_S_DRIVER_OK
    );
    assert!(lock(&dev).is_activated());
}

fn bring_up_with(t: &mut MmioTransport, size: u32, desc: u64) -> u32 {
    negotiate(t, u64::MAX);
    write_reg(t, 0x30, 0);
    write_reg(t, 0x38, size);
    write_reg(t, 0x80, desc as u32);
    write_reg(t, 0x84, (desc >> 32) as u32);
    write_reg(t, 0x90, 0x2000);
    write_reg(t, 0xa0, 0x3000);
    write_reg(t, 0x44, 1);
    write_reg(t, 0x70, DRIVER_READY | VIRTIO_CONFIG_S_DRIVER_OK);
    read_reg(t, 0x70)
}

#[test]
fn bad_queue_size_fails_activation() {
    for size in [0u32, 3, 100, 512, 0x1_0000] {
        let (dev, mut t) = rng_transport();
        let status = bring_up_with(&mut t, size, 0x1000);
        assert_eq!(status & VIRTIO_CONFIG_S_DRIVER_OK, 0, "size {size}");
        assert_ne!(status & VIRTIO_CONFIG_S_NEEDS_RESET, 0, "size {size}");
        assert!(!lock(&dev).is_activated());
        assert!(matches!(
            t.last_activation_error(),
            Some(QueueSetupError::Size { .. })
        ));
        assert_ne!(t.interrupt().status() & InterruptKind::Config as u32, 0);
    }
}

#[test]
fn rings_outside_guest_memory_fail_activation() {
    let (dev, mut t) = rng_transport();
    let status = bring_up_with(&mut t, 16, 0x10_0000_0000);
    assert_ne!(status & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    assert!(!lock(&dev).is_activated());
    assert!(matches!(
        t.last_activation_error(),
        Some(QueueSetupError::OutsideMemory { index: 0 })
    ));
    // Misaligned descriptor table.
    let (_dev, mut t) = rng_transport();
    let status = bring_up_with(&mut t, 16, 0x1008);
    assert_ne!(status & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    // Reset recovers.
    write_reg(&mut t, 0x70, 0);
    assert_eq!(read_reg(&mut t, 0x70), 0);
}

#[test]
fn queue_config_ignored_outside_features_ok() {
    let mem = guest_memory();
    let (_dev, mut t) = rng_transport();
    // Before FEATURES_OK: ignored.
    write_reg(&mut t, 0x70, VIRTIO_CONFIG_S_ACKNOWLEDGE);
    write_reg(&mut t, 0x30, 0);
    write_reg(&mut t, 0x44, 1);
    assert_eq!(read_reg(&mut t, 0x44), 0);
    // After DRIVER_OK: ignored too.
    let q = DriverQueue::new(&mem, 0, 16);
    bring_up(&mut t, &[&q]);
    write_reg(&mut t, 0x44, 0);
    assert_eq!(read_reg(&mut t, 0x44), 1);
}

#[test]
fn queue_notify_signals_queue_eventfd() {
    let (dev, mut t) = rng_transport();
    write_reg(&mut t, 0x50, 0);
    assert_eq!(lock(&dev).queue_events()[0].read().unwrap(), 1);
    // Out-of-range index: ignored, nothing signalled.
    write_reg(&mut t, 0x50, 5);
    assert!(lock(&dev).queue_events()[0].read().is_err());
    assert_eq!(t.queue_notify_evts().len(), 1);
}

#[test]
fn interrupt_status_and_ack() {
    let (_dev, mut t) = rng_transport();
    let int = t.interrupt().clone();
    int.trigger(InterruptKind::Vring).unwrap();
    int.trigger(InterruptKind::Config).unwrap();
    assert_eq!(read_reg(&mut t, 0x60), 3);
    assert_eq!(int.irq_evt().read().unwrap(), 2);
    write_reg(&mut t, 0x64, 1);
    assert_eq!(read_reg(&mut t, 0x60), 2);
    write_reg(&mut t, 0x64, 2);
    assert_eq!(read_reg(&mut t, 0x60), 0);
}

#[test]
fn config_generation_bumps_on_config_change() {
    let (_dev, mut t) = rng_transport();
    let g0 = read_reg(&mut t, 0xfc);
    t.notify_config_change().unwrap();
    assert_eq!(read_reg(&mut t, 0xfc), g0.wrapping_add(1));
}

#[test]
fn odd_sized_or_unaligned_register_access_is_harmless() {
    let (_dev, mut t) = rng_transport();
    let mut b = [0xffu8; 2];
    t.read(0x00, &mut b);
    assert_eq!(b, [0, 0]);
    let mut b8 = [0xffu8; 8];
    t.read(0x02, &mut b8);
    assert_eq!(b8, [0; 8]);
    t.write(0x70, &[1]);
    assert_eq!(read_reg(&mut t, 0x70), 0);
    t.write(0x71, &1u32.to_le_bytes());
    assert_eq!(read_reg(&mut t, 0x70), 0);
    // Beyond the window.
    let mut b = [0xffu8; 4];
    t.read(0x2000, &mut b);
    assert_eq!(b, [0; 4]);
    t.write(0x2000, &[1, 2, 3, 4]);
}
