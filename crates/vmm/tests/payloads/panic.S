/* Prints what a panicking Linux prints, then resets as panic=-1 reboot=k would
 * (exit 5, GuestPanic). */
    .include "common.inc"
    .text
    .globl _start
_start:
    print msg
    mov $I8042_CMD, %dx
    mov $0xfe, %al
    outb %al, %dx
1:  hlt
    jmp 1b
    .include "puts.inc"
msg: .asciz "[    1.234567] Kernel panic - not syncing: test payload\n"
