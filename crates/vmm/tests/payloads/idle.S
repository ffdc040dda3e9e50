/* Prints a marker, then halts forever (interrupts are off, so the vCPU sleeps in KVM):
 * an idle VM for memory measurements. */
    .include "common.inc"
    .text
    .globl _start
_start:
    print msg
1:  hlt
    jmp 1b
    .include "puts.inc"
msg: .asciz "idle\n"
