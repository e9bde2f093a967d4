// ZEROSHARD_API marks what libzeroshard.so exports. The library is built with hidden visibility,
// so a declaration of a public header that lacks it stays internal to the library.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define ZEROSHARD_API __attribute__((visibility("default")))
/// A member of an exported class that only the library itself calls.
#define ZEROSHARD_LOCAL __attribute__((visibility("hidden")))
#else
#define ZEROSHARD_API
#define ZEROSHARD_LOCAL
#endif
