"""Checks a shared library's ELF structure before anything maps it.

Why: dlopen maps a library's segments with mmap and touches them; a file cut
short (an interrupted copy, a full disk) makes that touch a SIGBUS that kills
the process with no message, and dlopen of a FIFO blocks forever. Reading the
headers first (the file must be a regular file, a complete ELF header for this
machine, and every header table and loadable segment inside the file) turns
both into a plain rejection that names the file and the problem."""

from __future__ import annotations

import os
import stat
import struct
import sys

ET_DYN = 3
PT_LOAD, PT_DYNAMIC = 1, 2
SHT_NOBITS = 8
_CLASS_64 = 2
_ELF_HEADER = {1: 52, 2: 64}


def regular_file_problem(path: str) -> str | None:
    """Why `path` is not a regular file (a FIFO, a device, a folder), or None."""
    try:
        st = os.stat(path)
    except OSError as e:
        return e.strerror or str(e)
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else ("a folder" if stat.S_ISDIR(st.st_mode) else "a special file")
        return f"{kind}, not a regular file"
    return None


def elf_problem(path: str) -> str | None:
    """Why `path` cannot be a complete shared library for this machine, or None.

    Opens without blocking (a FIFO swapped in after the stat cannot hang the
    read) and judges the bytes read through that one descriptor."""
    problem = regular_file_problem(path)
    if problem:
        return problem
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return e.strerror or str(e)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        with os.fdopen(os.dup(fd), "rb") as f:
            return _layout_problem(f, st.st_size)
    finally:
        os.close(fd)


def _layout_problem(f, size: int) -> str | None:
    ident = f.read(16)
    if len(ident) < 16 or ident[:4] != b"\x7fELF":
        return "no ELF header"
    cls, data = ident[4], ident[5]
    if cls not in _ELF_HEADER or data not in (1, 2):
        return "unknown ELF class or byte order"
    bits = 64 if cls == _CLASS_64 else 32
    if bits != struct.calcsize("P") * 8:
        return f"a {bits}-bit library; this Python is {struct.calcsize('P') * 8}-bit"
    if ("little" if data == 1 else "big") != sys.byteorder:
        return "built for the other byte order"
    if size < _ELF_HEADER[cls]:
        return f"truncated: {size} bytes, shorter than its own ELF header"
    end = "<" if data == 1 else ">"
    f.seek(16)
    if cls == _CLASS_64:
        (
            e_type,
            e_machine,
            _v,
            _entry,
            phoff,
            shoff,
            _flags,
            _ehsize,
            phentsize,
            phnum,
            shentsize,
            shnum,
            _shstrndx,
        ) = struct.unpack(end + "HHIQQQIHHHHHH", f.read(48))
    else:
        (
            e_type,
            e_machine,
            _v,
            _entry,
            phoff,
            shoff,
            _flags,
            _ehsize,
            phentsize,
            phnum,
            shentsize,
            shnum,
            _shstrndx,
        ) = struct.unpack(end + "HHIIIIIHHHHHH", f.read(36))
    if e_type != ET_DYN:
        return f"an ELF file of type {e_type}, not a shared library (type {ET_DYN})"
    host = host_machine()
    if host is not None and e_machine != host:
        return f"built for another machine (ELF machine {e_machine}; this Python runs on {host})"
    tables = [("program header table", phoff, phentsize, phnum), ("section header table", shoff, shentsize, shnum)]
    for what, off, entsize, num in tables:
        if off and off + entsize * num > size:
            return f"truncated: its {what} ends at byte {off + entsize * num}, the file has {size} bytes"
    return _segments_problem(f, size, end, cls, phoff, phentsize, phnum) or _sections_problem(
        f, size, end, cls, shoff, shentsize, shnum
    )


def _segments_problem(f, size, end, cls, phoff, phentsize, phnum) -> str | None:
    fmt = end + ("IIQQQQQQ" if cls == _CLASS_64 else "IIIIIIII")
    need = struct.calcsize(fmt)
    if phnum and phentsize < need:
        return "corrupt: program headers are too small"
    for i in range(phnum):
        f.seek(phoff + i * phentsize)
        fields = struct.unpack(fmt, f.read(need))
        if cls == _CLASS_64:
            p_type, p_offset, p_filesz = fields[0], fields[2], fields[5]
        else:
            p_type, p_offset, p_filesz = fields[0], fields[1], fields[4]
        if p_type in (PT_LOAD, PT_DYNAMIC) and p_offset + p_filesz > size:
            return f"truncated: segment {i} ends at byte {p_offset + p_filesz}, the file has {size} bytes"
    return None


def _sections_problem(f, size, end, cls, shoff, shentsize, shnum) -> str | None:
    fmt = end + ("IIQQQQIIQQ" if cls == _CLASS_64 else "IIIIIIIIII")
    need = struct.calcsize(fmt)
    if not shoff or not shnum:
        return None
    if shentsize < need:
        return "corrupt: section headers are too small"
    for i in range(shnum):
        f.seek(shoff + i * shentsize)
        fields = struct.unpack(fmt, f.read(need))
        sh_type, sh_offset, sh_size = fields[1], fields[4], fields[5]
        if sh_type != SHT_NOBITS and sh_offset + sh_size > size:
            return f"truncated: section {i} ends at byte {sh_offset + sh_size}, the file has {size} bytes"
    return None


_HOST: list = []


def host_machine() -> int | None:
    """The ELF machine number of this Python (from its own executable), or None if unreadable."""
    if not _HOST:
        machine = None
        try:
            with open(sys.executable, "rb") as f:
                head = f.read(20)
            if head[:4] == b"\x7fELF":
                machine = struct.unpack(("<" if head[5] == 1 else ">") + "H", head[18:20])[0]
        except OSError:
            pass
        _HOST.append(machine)
    return _HOST[0]
