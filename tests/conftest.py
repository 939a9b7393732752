"""Shared test fixtures."""
import pytest
import torch


@pytest.fixture
def float64():
    """Run a test in float64 with a fixed seed; the default dtype is restored afterwards."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(old)

