//! COM1 (ports 0x3f8..0x3ff, IRQ 4): a vm-superio 16550A whose transmitter writes to the
//! console sink.
//!
//! The sink copies every byte to the serial log (or stdout) and lets [`ConsoleWatch`] see
//! it: the watch notices "Kernel panic" with a bounded look-behind (so that the reset
//! `panic=-1` triggers is reported as a guest panic) and keeps the last [`TAIL_BYTES`] of
//! output to print when the VM fails. vm-superio raises the THR-empty interrupt after each
//! transmitted byte when the guest enabled it, which is what keeps Linux's interrupt-driven
//! console fast (without it the 8250 driver falls back to slow polling with timeouts).

use sandcell_proto::sync::lock;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use vm_superio::Serial;
use vm_superio::serial::NoEvents;

use super::IrqTrigger;
use crate::bus::BusDevice;
use crate::snapshot::{DeviceStateError, Persist};

pub const COM1_BASE: u64 = 0x3f8;
pub const COM1_LEN: u64 = 8;
/// How much console output is kept for error reports.
pub const TAIL_BYTES: usize = 16 * 1024;
const PANIC_MARKER: &[u8] = b"Kernel panic";

/// What the VMM learns from the console stream. Shared between the serial device (vCPU
/// threads) and the VMM thread.
pub struct ConsoleWatch {
    panic_seen: AtomicBool,
    state: Mutex<WatchState>,
}

struct WatchState {
    /// The last `PANIC_MARKER.len()` bytes, oldest first: the look-behind for the marker.
    window: [u8; PANIC_MARKER.len()],
    tail: VecDeque<u8>,
}

impl Default for ConsoleWatch {
    fn default() -> ConsoleWatch {
        ConsoleWatch {
            panic_seen: AtomicBool::new(false),
            state: Mutex::new(WatchState {
                window: [0; PANIC_MARKER.len()],
                tail: VecDeque::with_capacity(TAIL_BYTES),
            }),
        }
    }
}

impl ConsoleWatch {
    pub fn observe(&self, bytes: &[u8]) {
        let mut st = lock(&self.state);
        for &b in bytes {
            st.window.copy_within(1.., 0);
            st.window[PANIC_MARKER.len() - 1] = b;
            if st.window == PANIC_MARKER {
                self.panic_seen.store(true, Ordering::Release);
            }
            if st.tail.len() == TAIL_BYTES {
                st.tail.pop_front();
            }
            st.tail.push_back(b);
        }
    }

    pub fn panic_seen(&self) -> bool {
        self.panic_seen.load(Ordering::Acquire)
    }

    /// The last output, lossily decoded.
    pub fn tail(&self) -> String {
        let st = lock(&self.state);
        let (a, b) = st.tail.as_slices();
        let mut bytes = Vec::with_capacity(a.len() + b.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Where console bytes go.
pub enum ConsoleOutput {
    File(CappedFile),
    Stdout,
}

/// Largest size of the serial log file (and of its `.1`): the guest decides what it
/// writes to its console, the host's disk must not be its to fill (issue 12).
pub const SERIAL_LOG_CAP: u64 = 4 << 20;

/// The serial log (`--serial-log`), rotated at a cap: once `<log>` would pass it, it becomes
/// `<log>.1` (replacing the previous one) and a new `<log>` starts, so the two hold at most
/// twice the cap and `<log>` ends with the latest output.
pub struct CappedFile {
    file: File,
    path: std::path::PathBuf,
    written: u64,
    cap: u64,
}

impl CappedFile {
    /// `file`, just opened (and truncated) at `path`.
    pub fn new(file: File, path: &std::path::Path, cap: u64) -> CappedFile {
        let written = file.metadata().map(|m| m.len()).unwrap_or(0);
        CappedFile {
            file,
            path: path.to_path_buf(),
            written,
            cap,
        }
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let mut old = self.path.as_os_str().to_owned();
        old.push(".1");
        self.written = 0;
        match std::fs::rename(&self.path, &old) {
            Ok(()) => {
                self.file = std::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(true)
                    .open(&self.path)?;
                Ok(())
            }
            // Its directory went (or the name): empty the file we hold instead.
            Err(_) => {
                self.file.set_len(0)?;
                std::io::Seek::rewind(&mut self.file).map(|_| ())
            }
        }
    }
}

impl Write for CappedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.written + buf.len() as u64 > self.cap {
            self.rotate()?;
        }
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

pub struct ConsoleSink {
    out: ConsoleOutput,
    watch: std::sync::Arc<ConsoleWatch>,
    write_failed: bool,
}

impl ConsoleSink {
    pub fn new(out: ConsoleOutput, watch: std::sync::Arc<ConsoleWatch>) -> ConsoleSink {
        ConsoleSink {
            out,
            watch,
            write_failed: false,
        }
    }
}

impl Write for ConsoleSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.watch.observe(buf);
        let res = match &mut self.out {
            ConsoleOutput::File(f) => f.write_all(buf),
            ConsoleOutput::Stdout => std::io::stdout().lock().write_all(buf),
        };
        // The guest must never stall on the console: a failed write loses the bytes (the
        // tail still has them) and is reported once.
        if let Err(e) = res
            && !self.write_failed
        {
            tracing::warn!("console output write failed, dropping console output: {e}");
            self.write_failed = true;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if let ConsoleOutput::Stdout = self.out {
            let _ = std::io::stdout().lock().flush();
        }
        Ok(())
    }
}

pub struct SerialConsole {
    uart: Serial<IrqTrigger, NoEvents, ConsoleSink>,
}

impl SerialConsole {
    pub fn new(irq: IrqTrigger, sink: ConsoleSink) -> SerialConsole {
        SerialConsole {
            uart: Serial::new(irq, sink),
        }
    }
}

impl BusDevice for SerialConsole {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = self.uart.read((offset + i as u64) as u8);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, byte) in data.iter().enumerate() {
            if let Err(e) = self.uart.write((offset + i as u64) as u8, *byte) {
                tracing::debug!("serial write at offset {offset} failed: {e:?}");
            }
        }
    }
}

/// The 16550's registers and receive FIFO (a serde mirror of vm-superio's SerialState).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SerialState {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub in_buffer: Vec<u8>,
}

impl Persist for SerialConsole {
    type State = SerialState;
    type Args = (IrqTrigger, ConsoleSink);
    type Error = DeviceStateError;

    fn save(&self) -> SerialState {
        let s = self.uart.state();
        SerialState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }

    /// Re-raises a pending interrupt (vm-superio does), so the caller restores this after
    /// the irqchip state, which would otherwise overwrite it.
    fn restore((irq, sink): Self::Args, s: &SerialState) -> Result<Self, DeviceStateError> {
        let state = vm_superio::serial::SerialState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer.clone(),
        };
        // from_state checks the FIFO length.
        let uart = Serial::from_state(&state, irq, NoEvents, sink)
            .map_err(|e| DeviceStateError::new("serial", format!("{e:?}")))?;
        Ok(SerialConsole { uart })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use vmm_sys_util::eventfd::EventFd;

    #[test]
    fn panic_marker_is_found_across_writes() {
        let w = ConsoleWatch::default();
        w.observe(b"booting...\nKernel pa");
        assert!(!w.panic_seen());
        w.observe(b"nic - not syncing");
        assert!(w.panic_seen());
    }

    #[test]
    fn near_misses_are_not_panics() {
        let w = ConsoleWatch::default();
        w.observe(b"Kernel panicked? no: kernel panic, Kernel  panic, Kernel pani");
        // "Kernel panicked" contains the marker: that one counts.
        assert!(w.panic_seen());
        let w = ConsoleWatch::default();
        w.observe(b"kernel panic, Kernel  panic, Kernel pani c");
        assert!(!w.panic_seen());
    }

    #[test]
    fn tail_keeps_the_last_bytes_only() {
        let w = ConsoleWatch::default();
        let big: Vec<u8> = (0..TAIL_BYTES + 100)
            .map(|i| b'a' + (i % 26) as u8)
            .collect();
        w.observe(&big);
        w.observe(b"END");
        let t = w.tail();
        assert_eq!(t.len(), TAIL_BYTES);
        assert!(t.ends_with("END"));
    }

    #[test]
    fn a_guest_writing_without_end_leaves_a_capped_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("serial.log");
        let cap = 64 * 1024;
        let file = CappedFile::new(File::create(&path).expect("create"), &path, cap);
        let mut sink = ConsoleSink::new(ConsoleOutput::File(file), Arc::default());
        let chunk = [b'x'; 1000];
        for _ in 0..1000 {
            sink.write_all(&chunk).expect("write");
        }
        sink.write_all(b"the end").expect("write");
        let log = std::fs::read(&path).expect("read");
        assert!(log.len() as u64 <= cap, "{} > {cap}", log.len());
        assert!(log.ends_with(b"the end"));
        let old = std::fs::metadata(dir.path().join("serial.log.1")).expect("rotated");
        assert!(old.len() <= cap && old.len() > 0);
    }

    #[test]
    fn transmitted_bytes_reach_the_file_and_raise_thre_interrupts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("serial.log");
        let file = CappedFile::new(File::create(&path).expect("create"), &path, SERIAL_LOG_CAP);
        let watch = Arc::new(ConsoleWatch::default());
        let evt = EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK).expect("eventfd");
        let irq = IrqTrigger(evt.try_clone().expect("clone"));
        let mut com1 = SerialConsole::new(
            irq,
            ConsoleSink::new(ConsoleOutput::File(file), watch.clone()),
        );
        let mut iir = [0u8];
        com1.write(1, &[0x02]); // IER: THR empty interrupt on
        let _ = evt.read(); // enabling it raises one at once
        com1.read(2, &mut iir); // the driver's ack: reading IIR clears the pending THRE
        for b in b"hi\n" {
            com1.write(0, &[*b]);
            com1.read(2, &mut iir);
            assert_eq!(iir[0] & 0x0f, 0x02, "IIR reports THR empty");
        }
        assert_eq!(std::fs::read(&path).expect("read"), b"hi\n");
        assert_eq!(evt.read().expect("interrupts raised"), 3);
        assert_eq!(watch.tail(), "hi\n");
    }
}
