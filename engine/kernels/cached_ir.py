"""Kernels loaded from numba's cache keep their LLVM IR as bytes until a compile needs it.

numba 0.68 loads a cached function as its machine code plus the function's LLVM IR ("shared
bitcode"), which it parses into a live LLVM module and keeps for as long as the process runs. That
module is read in one case only: when a function compiled later in this process calls the cached
one and links its IR in (numba's `CPUCodeLibrary._get_module_for_linking`). An engine whose kernels
all come from the cache never compiles, yet the parsed modules are most of what loading the kernels
costs: measured on the 0.31 B bench MoE (Q8_0), warm-up's kernel load took 82 MB of anonymous
memory, 37 MB of it these modules (9.4 MB of bitcode). Under a RAM cap every one of those MB is an
expert the cache cannot hold.

So after numba has loaded a cached function (and read its symbol names from the module), the module
is dropped and its bitcode kept; a later compile that links the function parses it again, as
numba would have at load. Nothing else of numba's behaviour changes. If numba's internals are not
the ones this was written against, install() leaves numba as it is.
"""
from __future__ import annotations


def installed() -> bool:
    """Whether cached functions load without a live IR module in this process."""
    from numba.core import codegen
    return getattr(codegen.CPUCodeLibrary._unserialize, "colibri_cached_ir", False)


def install() -> bool:
    """Patch numba once (idempotent); False where its internals differ from 0.68's."""
    import llvmlite.binding as ll
    from numba.core import codegen
    cls = codegen.CPUCodeLibrary
    if installed():
        return True
    if not (hasattr(cls, "_get_module_for_linking") and isinstance(cls.__dict__.get("_unserialize"), classmethod)):
        return False
    unserialize = cls.__dict__["_unserialize"].__func__
    for_linking = cls._get_module_for_linking

    def unserialize_keeping_bytes(klass, codegen_, state):
        library = unserialize(klass, codegen_, state)
        _name, kind, data = state
        if kind == "object" and getattr(library, "_shared_module", None) is not None:
            library._colibri_bitcode = data[1]  # the bytes numba parsed: parsed again only to link
            library._shared_module = None
        return library

    def module_for_linking(self):
        bitcode = getattr(self, "_colibri_bitcode", None)
        if bitcode is not None and self._shared_module is None:
            self._shared_module = ll.parse_bitcode(bitcode)
            self._colibri_bitcode = None
        return for_linking(self)

    unserialize_keeping_bytes.colibri_cached_ir = True
    cls._unserialize = classmethod(unserialize_keeping_bytes)
    cls._get_module_for_linking = module_for_linking
    return True
