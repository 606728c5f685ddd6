"""The data-set registry (``registry.json``): files, md5, source and licence of every data set.

This folder documents the data sets and never holds data (see ``README.md`` here). It is installed
as ``graphattn.datasets`` so the registry travels with the package.
"""
