"""torch_fl"""
