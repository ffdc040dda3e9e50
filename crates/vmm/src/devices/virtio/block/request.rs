//! One virtio-blk request: parse a descriptor chain, run it against the disk, write the
//! status byte (virtio 1.2 §5.2.6).
//!
//! Layout of a request chain: a 16-byte device-readable header (type u32, reserved u32,
//! sector u64), the data (device-readable for OUT, device-writable for IN/GET_ID), and
//! a final device-writable status byte. Anything the guest gets wrong (short header,
//! no status byte, ranges past the disk, unaligned lengths, buffers outside guest
//! memory) ends as an IOERR/UNSUPP status or, when not even a status byte is writable,
//! as a used entry of length 0. Never as a panic.

use std::io::{Read, Write};

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_queue::{DescriptorChain, Reader, Writer};

use super::disk::{Disk, SECTOR_SIZE};
use crate::memory::GuestMemory;

/// Size of the bounce buffer between guest memory and the disk file: bounds the
/// memory one request costs us whatever its length.
pub const BOUNCE_SIZE: usize = 128 * 1024;
const HEADER_LEN: usize = 16;

/// Outcome of a request: the status byte and how many data bytes went to the guest.
struct Outcome {
    status: u32,
    written: usize,
}

impl Outcome {
    fn status(status: u32) -> Outcome {
        Outcome { status, written: 0 }
    }
}

/// What a request needs from the device besides the chain.
pub struct RequestContext<'a> {
    pub disk: &'a mut Disk,
    pub read_only: bool,
    pub disk_id: &'a [u8; VIRTIO_BLK_ID_BYTES as usize],
    pub bounce: &'a mut Vec<u8>,
}

/// Execute the request in `chain`; returns the used length (bytes written to the guest,
/// status byte included).
pub fn handle_chain(
    ctx: &mut RequestContext<'_>,
    mem: &GuestMemory,
    chain: DescriptorChain<&GuestMemory>,
) -> u32 {
    let (Ok(mut reader), Ok(mut writer)) = (chain.clone().reader(mem), chain.writer(mem)) else {
        return 0;
    };
    let writable = writer.available_bytes();
    if writable == 0 {
        return 0;
    }
    // The status byte is the last writable byte; everything before it is data.
    let Ok(mut status_writer) = writer.split_at(writable - 1) else {
        return 0;
    };
    let outcome = run(ctx, &mut reader, &mut writer);
    if status_writer.write_all(&[outcome.status as u8]).is_err() {
        return outcome.written as u32;
    }
    (outcome.written + 1) as u32
}

fn run(
    ctx: &mut RequestContext<'_>,
    reader: &mut Reader<'_>,
    data_out: &mut Writer<'_>,
) -> Outcome {
    let mut header = [0u8; HEADER_LEN];
    if reader.read_exact(&mut header).is_err() {
        return Outcome::status(VIRTIO_BLK_S_IOERR);
    }
    let req_type = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let mut sector = [0u8; 8];
    sector.copy_from_slice(&header[8..16]);
    let sector = u64::from_le_bytes(sector);

    match req_type {
        VIRTIO_BLK_T_IN => {
            let len = data_out.available_bytes();
            let Some(offset) = checked_range(ctx.disk, sector, len) else {
                return Outcome::status(VIRTIO_BLK_S_IOERR);
            };
            read_into_guest(ctx, offset, len, data_out)
        }
        VIRTIO_BLK_T_OUT => {
            if ctx.read_only {
                return Outcome::status(VIRTIO_BLK_S_IOERR);
            }
            let len = reader.available_bytes();
            let Some(offset) = checked_range(ctx.disk, sector, len) else {
                return Outcome::status(VIRTIO_BLK_S_IOERR);
            };
            write_from_guest(ctx, offset, len, reader)
        }
        VIRTIO_BLK_T_FLUSH => match ctx.disk.flush() {
            Ok(()) => Outcome::status(VIRTIO_BLK_S_OK),
            Err(_) => Outcome::status(VIRTIO_BLK_S_IOERR),
        },
        VIRTIO_BLK_T_GET_ID => {
            let n = data_out.available_bytes().min(ctx.disk_id.len());
            match data_out.write_all(&ctx.disk_id[..n]) {
                Ok(()) => Outcome {
                    status: VIRTIO_BLK_S_OK,
                    written: n,
                },
                Err(_) => Outcome::status(VIRTIO_BLK_S_IOERR),
            }
        }
        _ => Outcome::status(VIRTIO_BLK_S_UNSUPP),
    }
}

/// Byte offset of `sector` if `[sector*512, +len)` is whole sectors inside the disk.
fn checked_range(disk: &Disk, sector: u64, len: usize) -> Option<u64> {
    let len = u64::try_from(len).ok()?;
    if len % SECTOR_SIZE != 0 {
        return None;
    }
    let offset = sector.checked_mul(SECTOR_SIZE)?;
    let end = offset.checked_add(len)?;
    (end <= disk.capacity()).then_some(offset)
}

fn read_into_guest(
    ctx: &mut RequestContext<'_>,
    offset: u64,
    len: usize,
    out: &mut Writer<'_>,
) -> Outcome {
    ctx.bounce.resize(BOUNCE_SIZE, 0);
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(BOUNCE_SIZE);
        let buf = &mut ctx.bounce[..n];
        if ctx.disk.read_at(buf, offset + done as u64).is_err() || out.write_all(buf).is_err() {
            return Outcome {
                status: VIRTIO_BLK_S_IOERR,
                written: done,
            };
        }
        done += n;
    }
    Outcome {
        status: VIRTIO_BLK_S_OK,
        written: len,
    }
}

fn write_from_guest(
    ctx: &mut RequestContext<'_>,
    offset: u64,
    len: usize,
    input: &mut Reader<'_>,
) -> Outcome {
    ctx.bounce.resize(BOUNCE_SIZE, 0);
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(BOUNCE_SIZE);
        let buf = &mut ctx.bounce[..n];
        if input.read_exact(buf).is_err() || ctx.disk.write_at(buf, offset + done as u64).is_err() {
            return Outcome::status(VIRTIO_BLK_S_IOERR);
        }
        done += n;
    }
    Outcome::status(VIRTIO_BLK_S_OK)
}
