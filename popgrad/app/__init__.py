"""Step 6 of the data flow: the application -- the ``popgrad`` command, its jobs, reports and figures.

* :mod:`.config` -- the one run configuration: defaults, flag specs, config files, ``resolve`` (frozen);
* :mod:`.kinds` -- one record per kind of run (trainer, checks, figures, report sections);
* :mod:`.cli` -- argument parsing and ``main`` (no job logic);
* :mod:`.jobs` -- ``popgrad run`` for every kind of run (one code path);
* :mod:`.scheduler` -- connecting to a Dask scheduler (``--scheduler``);
* :mod:`.sweep` -- ``popgrad sweep`` (Dask);
* :mod:`.report` -- ``report.json`` / ``report.md``;
* :mod:`.plots` -- the figures (``matplotlib.figure.Figure``; no backend switch).
"""
