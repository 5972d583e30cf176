"""Step 6 of the data flow: the application -- the ``popgrad`` command, its jobs, reports and figures.

* :mod:`.config` -- the one validator of flags, config files and sweep specs;
* :mod:`.cli` -- argument parsing and ``main`` (no job logic);
* :mod:`.jobs` -- ``popgrad run`` for every task kind (one code path);
* :mod:`.sweep` -- ``popgrad sweep`` (Dask);
* :mod:`.report` -- ``report.json`` / ``report.md``;
* :mod:`.plots` -- the figures (``matplotlib.figure.Figure``; no backend switch).
"""
