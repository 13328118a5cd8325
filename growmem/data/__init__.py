"""Datasets: synthetic teacher-student regression and loaders for standard file formats."""
