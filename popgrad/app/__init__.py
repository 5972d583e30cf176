"""Step 6 of the data flow: the application -- the ``popgrad`` command, its jobs, reports and figures.

* :mod:`.settings` -- user errors (:class:`~.settings.CLIError`) and :class:`~.settings.Flag`, one config key;
* :mod:`.tasks` -- the task's and the run's flags and defaults, ``build_task``;
* :mod:`.kinds` -- one module per kind of run (defaults, flags, settle, trainer, checks, figures, report
  section), the ``Kind`` protocol, ``RunConfig`` and the registry;
* :mod:`.config` -- the one run configuration, generic over the kinds: config files, ``merge``, ``resolve``
  (frozen);
* :mod:`.cli` -- argument parsing and ``main`` (no job logic);
* :mod:`.jobs` -- ``popgrad run`` for every kind of run (one code path);
* :mod:`.scheduler` -- connecting to a Dask scheduler (``--scheduler``);
* :mod:`.sweep` -- ``popgrad sweep`` (Dask);
* :mod:`.report`, :mod:`.report_html` -- ``report.json`` / ``report.md`` / ``report.html``;
* :mod:`.plots` -- the figures (``matplotlib.figure.Figure``; no backend switch).
"""
