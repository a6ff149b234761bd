"""Our own federated histogram boosting (``--engine treeflare``): XGBoost's hist algorithm on pairwise-masked sums of
the sites' histograms, written as a native XGBoost model. Pure: no NVFlare here (``treeflare.flare.xgb`` routes it)."""
