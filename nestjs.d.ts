/// <reference types="node" />
/**
 * stampede-cache/nestjs: a NestJS module providing a `StampedeCache` for injection and closing it on
 * application shutdown. Needs `@nestjs/common` and `@nestjs/core` (peer dependencies).
 */
// Self-contained on purpose: no import from @nestjs/common, so these types work with Nest 10 and 11
// (CommonJS) and 12 (ESM only) alike, from CommonJS and ESM projects.
import { StampedeCache, StampedeCacheOptions } from './index'

export { StampedeCache }

/** Injection token of the cache: the same instance as the `StampedeCache` class token. */
export declare const STAMPEDE_CACHE: 'STAMPEDE_CACHE'
/** Injection token of the options the cache was built with. */
export declare const STAMPEDE_CACHE_OPTIONS: 'STAMPEDE_CACHE_OPTIONS'

interface ModuleScope {
  /** Register the module globally: every module can inject the cache without importing it. Default false. */
  isGlobal?: boolean | undefined
  /** The same as `isGlobal`. */
  global?: boolean | undefined
}

/** The constructor's options, plus where the module is visible. */
export interface StampedeCacheModuleOptions extends StampedeCacheOptions, ModuleScope {}

/** An injection token: a class, a string or a symbol. */
export type InjectionToken = string | symbol | Function

/** What a Nest module's `imports` holds: a module class, a dynamic module (or its promise), a forwardRef. */
export type ModuleImport = (new (...args: any[]) => any) | { module: new (...args: any[]) => any } | Promise<{ module: new (...args: any[]) => any }> | { forwardRef: () => any }

/** The dynamic module `forRoot`/`forRootAsync` return: a Nest `DynamicModule`. */
export interface StampedeCacheDynamicModule {
  module: typeof StampedeCacheModule
  global: boolean
  imports?: any[]
  providers: any[]
  exports: any[]
}

export interface StampedeCacheModuleAsyncOptions extends ModuleScope {
  /** Modules that export the providers named in `inject`. */
  imports?: ModuleImport[] | undefined
  /** Makes the constructor's options (may be async) from the providers named in `inject`. */
  useFactory: (...args: any[]) => StampedeCacheOptions | undefined | Promise<StampedeCacheOptions | undefined>
  /** Providers handed to `useFactory`, found in `imports` or a global module. */
  inject?: Array<InjectionToken | { token: InjectionToken; optional: boolean }> | undefined
}

export declare class StampedeCacheModule {
  /** A module providing a `StampedeCache` built from `options`, closed on application shutdown. */
  static forRoot(options?: StampedeCacheModuleOptions): StampedeCacheDynamicModule
  /** The same, with the options made by `useFactory` from injected providers. */
  static forRootAsync(options: StampedeCacheModuleAsyncOptions): StampedeCacheDynamicModule
}

/** Injects the module's cache: the same as `@Inject(StampedeCache)`. */
export declare function InjectStampedeCache(): PropertyDecorator & ParameterDecorator

// ---- A drop-in for @nestjs/cache-manager ------------------------------------------------------
// Self-contained as above: Nest's ExecutionContext, CallHandler and Reflector appear as `any`, so
// subclasses written against any Nest version's types fit.

/** The token of the cache-manager object: the same string as @nestjs/cache-manager's. */
export declare const CACHE_MANAGER: 'CACHE_MANAGER'
/** @CacheKey's metadata key: the original's. */
export declare const CACHE_KEY_METADATA: 'cache_module:cache_key'
/** @CacheTTL's metadata key: the original's. */
export declare const CACHE_TTL_METADATA: 'cache_module:cache_ttl'
/** The token of CacheModule's options (register's, or what registerAsync made). */
export declare const CACHE_MODULE_OPTIONS: 'STAMPEDE_CACHE_MODULE_OPTIONS'

/**
 * CacheModule's options: the StampedeCache constructor's, except that `ttl` is cache-manager 7's
 * (ms an entry lives at all, never served after; 0 or absent: no expiry) and there is no `hardTtl`.
 */
export interface CacheModuleOptions extends Omit<StampedeCacheOptions, 'hardTtl' | 'ttl'> {
  /** ms an entry lives at all (cache-manager 7's ttl), never served after; 0 or absent: no expiry. */
  ttl?: number | undefined
  /** Register the module globally. Default false. */
  isGlobal?: boolean | undefined
  /**
   * ms: once less than this remains of an entry's life, it is served and refreshed once in the
   * background (stale-while-revalidate). Absent: an expired entry is a miss, loaded once.
   */
  refreshThreshold?: number | undefined
  /**
   * cache-manager's stores: in-memory Keyv stores and at most one `@keyv/redis` store (what
   * `createKeyv(url)` returns), taken as `redis: <its URL>`. Any other store throws ERR_INVALID_OPTION.
   */
  stores?: unknown
  /** cache-manager's default (false) only: `true` throws ERR_INVALID_OPTION. */
  nonBlocking?: false | undefined
  /** What `cacheId()` answers (default: the namespace). */
  cacheId?: string | undefined
}

/** What `useClass`/`useExisting` provide: the options, made by `createCacheOptions()`. */
export interface CacheOptionsFactory {
  createCacheOptions(): CacheModuleOptions | Promise<CacheModuleOptions>
}

export interface CacheModuleAsyncOptions {
  /** Modules that export the providers named in `inject` (or `useExisting`). */
  imports?: ModuleImport[] | undefined
  /** Makes the options (may be async) from the providers named in `inject`. */
  useFactory?: ((...args: any[]) => CacheModuleOptions | Promise<CacheModuleOptions>) | undefined
  /** Providers handed to `useFactory`. */
  inject?: Array<InjectionToken | { token: InjectionToken; optional: boolean }> | undefined
  /** A class instantiated in the module whose `createCacheOptions()` makes the options. */
  useClass?: (new (...args: any[]) => CacheOptionsFactory) | undefined
  /** An existing provider (from `imports` or a global module) whose `createCacheOptions()` makes the options. */
  useExisting?: (new (...args: any[]) => CacheOptionsFactory) | undefined
  /** Register the module globally. Default false. */
  isGlobal?: boolean | undefined
  /** More providers in the module's scope. */
  extraProviders?: any[] | undefined
}

/** The dynamic module `register`/`registerAsync` return: a Nest `DynamicModule`. */
export interface CacheDynamicModule {
  module: typeof CacheModule
  global: boolean
  imports?: any[]
  providers: any[]
  exports: any[]
}

/** @nestjs/cache-manager's CacheModule over a StampedeCache (also injectable by its class). */
export declare class CacheModule {
  static register(options?: CacheModuleOptions): CacheDynamicModule
  static registerAsync(options: CacheModuleAsyncOptions): CacheDynamicModule
}

/** cache-manager 7's wrap options; ttl and refreshThreshold may be functions of the value. */
export interface WrapOptions<T> {
  ttl?: number | ((value: T) => number) | undefined
  refreshThreshold?: number | ((value: T) => number) | undefined
}

/** cache-manager 7's event payloads (error present when the operation failed). */
export interface CacheEvents {
  /** When a key was found (`store: 'primary'`), or a read failed. */
  get: <T>(data: { key: string; value?: T; error?: unknown; store?: string }) => void
  mget: <T>(data: { keys: string[]; values?: Array<T | undefined>; error?: unknown }) => void
  /** Once with `store: 'primary'` and once without, per set (as cache-manager emits per store, then per call). */
  set: <T>(data: { key: string; value: T; error?: unknown; store?: string }) => void
  mset: <T>(data: { list: Array<{ key: string; value: T; ttl?: number | undefined }>; error?: unknown }) => void
  del: (data: { key: string; error?: unknown }) => void
  mdel: (data: { keys: string[]; error?: unknown }) => void
  clear: (error?: unknown) => void
  /** When a key was found: its stored record. */
  ttl: <T>(data: { key: string; value?: { value: T; expires: number | undefined }; error?: unknown }) => void
  refresh: <T>(data: { key: string; value: T; error?: unknown }) => void
}

/**
 * The token class of the cache-manager object (the same instance as CACHE_MANAGER), as
 * @nestjs/cache-manager exports, and its type: cache-manager 7's `Cache` methods.
 */
export declare abstract class Cache {}
export interface Cache {
  get<T>(key: string): Promise<T | undefined>
  mget<T>(keys: string[]): Promise<Array<T | undefined>>
  /** When the entry expires, epoch ms; undefined when missing or kept without a ttl. */
  ttl(key: string): Promise<number | undefined>
  set<T>(key: string, value: T, ttl?: number): Promise<T>
  mset<T>(list: Array<{ key: string; value: T; ttl?: number | undefined }>): Promise<Array<{ key: string; value: T; ttl?: number | undefined }>>
  del(key: string): Promise<boolean>
  mdel(keys: string[]): Promise<boolean>
  clear(): Promise<boolean>
  /** getOrLoad: concurrent calls for one key share one `fnc` call, across processes sharing the Redis. */
  wrap<T>(key: string, fnc: () => T | Promise<T>, ttl?: number | ((value: T) => number), refreshThreshold?: number | ((value: T) => number)): Promise<T>
  wrap<T>(key: string, fnc: () => T | Promise<T>, options: WrapOptions<T>): Promise<T>
  wrap<T>(key: string, fnc: () => T | Promise<T>, options: WrapOptions<T> & { raw: true }): Promise<{ value: T; expires: number | undefined }>
  on<E extends keyof CacheEvents>(event: E, listener: CacheEvents[E]): import('node:events').EventEmitter
  off<E extends keyof CacheEvents>(event: E, listener: CacheEvents[E]): import('node:events').EventEmitter
  /** Closes the StampedeCache; later calls reject with ERR_CLOSED. */
  disconnect(): Promise<undefined>
  /** The `cacheId` option, or the cache's namespace. */
  cacheId(): string
}

/**
 * @nestjs/cache-manager's CacheInterceptor over getOrLoad: GET results cached under the URL (or
 * @CacheKey) for @CacheTTL ms; concurrent requests for one key run the handler once.
 */
export declare class CacheInterceptor {
  protected readonly cacheManager: any
  protected readonly reflector: any
  protected readonly httpAdapterHost: any
  protected allowedMethods: string[]
  constructor(cacheManager: any, reflector: any)
  intercept(context: any, next: any): Promise<any>
  protected trackBy(context: any): Promise<string | undefined | null> | string | undefined | null
  protected isRequestCacheable(context: any): boolean
  protected setHeadersWhenHttp(context: any, value: any): void
}

/** `@CacheKey(key)`: a handler's cache key (or a function of the ExecutionContext). */
export declare function CacheKey(key: string | ((context: any) => string | undefined)): MethodDecorator & ClassDecorator
/** `@CacheTTL(ms)`: the life of a handler's (or controller's) cached results, or a function of the ExecutionContext. */
export declare function CacheTTL(ttl: number | ((context: any) => number | Promise<number>)): MethodDecorator & ClassDecorator
