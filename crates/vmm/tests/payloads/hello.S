/* Prints a marker, then powers off (exit 0). */
    .include "common.inc"
    .text
    .globl _start
_start:
    print msg
    power_off
    .include "puts.inc"
msg: .asciz "SANDCELL-PAYLOAD-HELLO\n"
