/* Raises an exception with the boot IDT (one null gate) in place: #UD cannot be
 * delivered, #GP neither, #DF neither: a triple fault (exit 4, TripleFault). */
    .include "common.inc"
    .text
    .globl _start
_start:
    print msg
    ud2
1:  hlt
    jmp 1b
    .include "puts.inc"
msg: .asciz "about to fault\n"
