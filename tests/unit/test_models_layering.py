"""`rofu.models` is a pure library: it imports with the web, database and cache stacks blocked."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = ("fastapi", "starlette", "sqlalchemy", "alembic", "redis", "psycopg", "uvicorn")


def test_models_imports_and_scores_with_io_stacks_blocked():
    program = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {BLOCKED!r}:
                    raise ImportError(f"rofu.models must not import {{name}}")
                return None

        sys.meta_path.insert(0, Block())
        import torch
        import rofu.models as models, rofu.models.policies, rofu.models.rofu_naive
        from rofu.models import RegulariserData, RewardNet, RewardNetConfig, RofuConfig, Transitions
        net = RewardNet(RewardNetConfig(context_dim=3, n_arms=2, hidden=(4,)))
        data = Transitions(torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 0]), torch.randn(5))
        reg = RegulariserData(data, 5, torch.tensor([3, 2]))
        scores = models.rofu_scores(net, torch.randn(2, 3), reg, RofuConfig(), torch.Generator())
        assert scores.ucb.shape == (2, 2)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r})
        assert not leaked, leaked
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
