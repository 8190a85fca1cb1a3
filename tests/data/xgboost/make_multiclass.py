#!/usr/bin/python3
"""Writes the 3-class model and its expected outputs for tests/unit/test_backends.c.

Run with Debian's python3-xgboost 1.7.4 (`apt-get install python3-xgboost`, then
`/usr/bin/python3 tests/data/xgboost/make_multiclass.py` from the repository root).
The data are synthetic: 4 features, the class is the largest of three fixed linear
scores; the test rows include missing values (NaN).
"""
import numpy as np
import xgboost as xgb

OUT = "tests/data/xgboost/"
rng = np.random.default_rng(7)
w = np.array([[1.0, -0.5, 0.2], [0.3, 1.0, -0.7], [-0.6, 0.4, 1.0], [0.2, 0.2, 0.2]])
x = rng.normal(size=(400, 4)).astype(np.float32)
y = np.argmax(x @ w, axis=1)
train, test = x[:360], x[360:].copy()
test[::7, 1] = np.nan
test[3::11, 3] = np.nan
params = {"objective": "multi:softprob", "num_class": 3, "max_depth": 2, "eta": 0.5,
          "tree_method": "exact", "base_score": 0.5, "nthread": 1, "seed": 0}
booster = xgb.train(params, xgb.DMatrix(train, label=y[:360]), num_boost_round=4)
booster.save_model(OUT + "multiclass-depth2-4rounds.json")
d = xgb.DMatrix(test, missing=np.nan)
prob = booster.predict(d)
margin = booster.predict(d, output_margin=True)
with open(OUT + "multiclass-depth2-4rounds.test.csv", "w") as f:
    f.write("x0,x1,x2,x3,p0,p1,p2,m0,m1,m2\n")
    for r in range(len(test)):
        vals = list(test[r]) + list(prob[r]) + list(margin[r])
        f.write(",".join("nan" if v != v else "%.9g" % v for v in vals) + "\n")
print("test rows:", len(test), "classes in train:", np.bincount(y[:360]))
