"""The command line, apart from the library: ``growmem`` (:mod:`growmem.app.cli`) and its sub-commands
``continual``, ``data`` and ``repro`` (:mod:`growmem.app.continual`, :mod:`growmem.app.data`,
:mod:`growmem.app.repro`), and what they share (:mod:`growmem.app.options`: the parser, argument types,
folder checks). Parsing, printing and exit codes live here; no library module imports this package."""
