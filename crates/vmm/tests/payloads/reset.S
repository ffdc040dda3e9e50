/* Prints a marker, then resets the CPU through the i8042 (exit 3, Reboot). */
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
msg: .asciz "about to reset\n"
