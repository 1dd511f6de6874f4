"""File mappings in the page cache: populating a mapping's page tables in one call, asking for
2 MiB folios, and telling whether a range came mapped 2 MiB at a time (engine.expert_store maps
missed experts so, and reads them again where they sit in small folios)."""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys

from engine.mempool import resident_bytes

# a mapped miss's page tables are filled by one madvise(MADV_POPULATE_READ) on the loading thread,
# not by the kernels' read faults, one per page. Linux >= 5.14; elsewhere (EINVAL) one
# MADV_WILLNEED readahead and the faults as before
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
# A file read through a MADV_HUGEPAGE mapping comes into the page cache in 2 MiB folios, and every
# later mapping of it gets one page-table entry per 2 MiB instead of 512 (Linux >= 6.16 on file
# systems with large folios, transparent huge pages not "never"); plain reads leave small folios.
MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)  # (Linux only)
_populate_works = [True]  # cleared by the first EINVAL (a kernel before 5.14)


def populate(mm: mmap.mmap) -> None:
    """Fill a fresh file mapping's page tables from the page cache (reading what it lacks) in one
    call, so the kernels take no page faults; before Linux 5.14, one readahead of what is missing."""
    if _populate_works[0]:
        try:
            mm.madvise(MADV_POPULATE_READ)
            return
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
            _populate_works[0] = False
    if hasattr(mmap, "MADV_WILLNEED") and resident_bytes(mm, 0, len(mm)) < len(mm):
        mm.madvise(mmap.MADV_WILLNEED)


def advise_huge(mm: mmap.mmap) -> None:
    """Ask for 2 MiB folios where the mapping's faults read the file (refused without huge pages)."""
    if MADV_HUGEPAGE is None:
        return
    try:
        mm.madvise(MADV_HUGEPAGE)
    except (OSError, ValueError):
        pass


def read_ahead_huge(fd: int, offset: int, nbytes: int) -> None:
    """Bring the file range into the page cache in 2 MiB folios (a failure leaves it to pread)."""
    start = offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
    try:
        mm = mmap.mmap(fd, offset + nbytes - start, mmap.MAP_SHARED, mmap.PROT_READ, offset=start)
    except (OSError, ValueError):
        return
    try:
        advise_huge(mm)
        populate(mm)
    except OSError:
        pass
    finally:
        mm.close()


HUGE = 2 << 20  # a PMD-mapped folio
_PAGEMAP_SCAN_WORKS = [True]


class _ScanArg(ctypes.Structure):  # struct pm_scan_arg (linux/fs.h)
    _fields_ = [(n, ctypes.c_uint64) for n in ("size", "flags", "start", "end", "walk_end", "vec", "vec_len",
                                                "max_pages", "category_inverted", "category_mask",
                                                "category_anyof_mask", "return_mask")]


class _PageRegion(ctypes.Structure):  # struct page_region
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64), ("categories", ctypes.c_uint64)]


_PAGEMAP_SCAN = (3 << 30) | (ctypes.sizeof(_ScanArg) << 16) | (ord("f") << 8) | 16  # _IOWR('f', 16, ...)
_PAGE_IS_HUGE = 1 << 6


def pmd_mapped_bytes(addr: int, nbytes: int) -> int | None:
    """Bytes of [addr, addr + nbytes) mapped 2 MiB at a time; None where the kernel cannot say."""
    if not _PAGEMAP_SCAN_WORKS[0] or not sys.platform.startswith("linux"):
        return None
    import fcntl
    vec = (_PageRegion * (nbytes // HUGE + 2))()
    arg = _ScanArg(size=ctypes.sizeof(_ScanArg), start=addr, end=addr + nbytes, vec=ctypes.addressof(vec),
                   vec_len=len(vec), category_mask=_PAGE_IS_HUGE, return_mask=_PAGE_IS_HUGE)
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
        try:
            n = fcntl.ioctl(fd, _PAGEMAP_SCAN, arg, True)
        finally:
            os.close(fd)
    except OSError:  # ENOTTY or EINVAL: a kernel without it
        _PAGEMAP_SCAN_WORKS[0] = False
        return None
    return sum(vec[i].end - vec[i].start for i in range(n))
