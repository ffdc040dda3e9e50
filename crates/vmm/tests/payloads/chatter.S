/* Prints "." forever with a short spin between dots: a guest that answers on its
 * console within a fraction of a millisecond whenever it runs (the restore benchmark
 * measures to its first byte after a restore). */
    .include "common.inc"
    .text
    .globl _start
_start:
    mov $COM1, %dx
    mov $'.', %al
1:  outb %al, %dx
    mov $300, %ecx
2:  dec %ecx
    jnz 2b
    jmp 1b
