/* Prints "tick N" lines forever, with a busy-wait between them, so that a test can
 * see output stop while the VM is paused and start again after resume. */
    .include "common.inc"
    .text
    .globl _start
_start:
    xor %ebx, %ebx              /* tick counter, 0-9 then wraps */
next:
    print tick
    mov %bl, %al
    add $'0', %al
    mov $COM1, %dx
    outb %al, %dx
    mov $'\n', %al
    outb %al, %dx
    inc %ebx
    cmp $10, %ebx
    jb 1f
    xor %ebx, %ebx
1:  mov $10000, %ecx             /* spin between lines (no pause: it may exit; on PVM
                                   this code is emulated, ~1 us per instruction) */
2:  dec %ecx
    jnz 2b
    jmp next
    .include "puts.inc"
tick: .asciz "tick "
