import unittest

from tinycalc import add, div, evaluate, mul, sub


class OpsTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_sub(self):
        self.assertEqual(sub(7, 2), 5)

    def test_mul(self):
        self.assertEqual(mul(3, 4), 12)

    def test_div(self):
        self.assertEqual(div(9, 3), 3)
        with self.assertRaises(ZeroDivisionError):
            div(1, 0)


class ParserTest(unittest.TestCase):
    def test_precedence(self):
        self.assertEqual(evaluate("2 * (3 + 4) - 1"), 13)

    def test_unary_and_float(self):
        self.assertEqual(evaluate("-1.5 + 2"), 0.5)

    def test_errors(self):
        for bad in ("(1 + 2", "1 +", "1 2"):
            with self.assertRaises(ValueError):
                evaluate(bad)


if __name__ == "__main__":
    unittest.main()
