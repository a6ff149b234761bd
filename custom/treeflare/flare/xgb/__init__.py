"""The federated XGBoost job's FLARE glue: ``controller`` (server: the federated server's lifecycle), ``executor``
(site: ``xgb.train`` against it), the ``protocol`` both import, the ``data_loader`` of NVFlare's own XGBoost recipe,
and ``progress`` (per-round lines)."""
