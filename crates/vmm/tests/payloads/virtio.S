/* Prints the kernel command line from the zero page (boot_params.hdr.cmd_line_ptr at
 * offset 0x228; rsi points at the zero page on entry), then probes the first four
 * virtio-mmio windows from 0xd0000000: "slotN id=D" for a virtio-mmio v2 device with
 * device ID D (single digit), "slotN empty" otherwise. Then powers off. */
    .include "common.inc"
    .set VIRTIO_BASE, 0xd0000000
    .set VIRTIO_MAGIC, 0x74726976     /* "virt" */
    .text
    .globl _start
_start:
    mov 0x228(%rsi), %eax             /* cmd_line_ptr (32-bit, zero-extends rax) */
    mov %rax, %rsi
    call puts
    print newline

    xor %ebx, %ebx                    /* slot index */
    mov $VIRTIO_BASE, %rdi
slot:
    print slot_prefix
    mov %bl, %al
    add $'0', %al
    mov $COM1, %dx
    outb %al, %dx
    movl 0x0(%rdi), %eax              /* MagicValue */
    cmp $VIRTIO_MAGIC, %eax
    jne empty
    movl 0x4(%rdi), %eax              /* Version */
    cmp $2, %eax
    jne empty
    print id_prefix
    movl 0x8(%rdi), %eax              /* DeviceID */
    add $'0', %al
    mov $COM1, %dx
    outb %al, %dx
    print newline
    jmp advance
empty:
    print empty_msg
advance:
    add $0x1000, %rdi
    inc %ebx
    cmp $4, %ebx
    jb slot
    power_off
    .include "puts.inc"
newline: .asciz "\n"
slot_prefix: .asciz "slot"
id_prefix: .asciz " id="
empty_msg: .asciz " empty\n"
